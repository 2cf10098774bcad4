"""Encrypted sync of a vault between devices through folders and rclone remotes (issue 30)."""
