"""Ray Serve wiring for llamaray: thin deployment classes around app/ and the app builder."""
