"""The run configuration: typed groups of the module's and the rollout callback's settings, keys that changed name
(refused with the new one named), and run config files built in code."""
