"""llamaray application code: plain Python, no Ray imports (deployments/ wires it into Ray Serve)."""
