"""tierlink.telemetry"""
