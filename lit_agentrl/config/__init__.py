"""The run configuration: keys that changed name, refused with the new one named."""
