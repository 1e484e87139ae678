"""tierlink.node"""
