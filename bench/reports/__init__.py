"""What the benches print and write: `python -m bench`'s table, JSON and chart (bench_report.py), the graph
bench's records, tables, targets and sizing (graph_report.py), and what several share (tables.py)."""
