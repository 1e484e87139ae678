"""tierlink.netem"""
