"""tierlink.policy"""
