"""tierlink.control"""
