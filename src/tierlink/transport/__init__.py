"""tierlink.transport"""
