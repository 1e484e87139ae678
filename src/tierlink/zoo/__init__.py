"""tierlink.zoo"""
