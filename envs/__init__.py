"""Batched multi-agent environments that live on the device."""
