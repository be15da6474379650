"""What the benches run and watch: the servers compared (servers.py), the bundled model (bundled.py), arms that
take turns (arms.py), Ray drivers of the bench's own (serve_driver.py, graph_probe.py), /proc (procfs.py,
procs.py), py-spy (pyspy.py), an OTLP/HTTP trace collector (otlp_collector.py) and a command's plumbing (run.py)."""
