"""tierlink.fleet"""
