"""tierlink.estimate"""
