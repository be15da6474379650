"""What a request leaves behind: its record for metrics, and its OpenTelemetry spans."""
