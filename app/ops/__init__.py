"""Running llamaray: the `llamaray` CLI, serve-config overlays and `check-config`, deployment defaults and
resource fit, Ray Serve's local settings, the KubeRay manifest. Plain data: never imports ray."""
