"""tierlink.cli"""
