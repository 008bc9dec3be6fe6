"""Collectives on the target: nccl -> hccl (gloo on cpu), process groups and NCCL settings."""
