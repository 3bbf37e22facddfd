"""The checkpoint directory: its format and manifest, writing it, inspecting it, signing it."""
