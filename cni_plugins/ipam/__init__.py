"""Delegation to an IPAM plugin: ours is called in-process, any other is exec'd from CNI_PATH as the spec says."""
