"""The instance-side agent: interruption listener, workload supervisor and checkpoint sync.

One agent runs per instance (`python -m migration.agent` or `baton-agent`). It polls the
IMDS-compatible metadata endpoint for spot notices, runs the training command in its own
process group with its output captured, tells the workload when to checkpoint, syncs a
directory-mode workload's checkpoint folder to the store, and reports everything to the
portal's agent API over HTTP. It never imports Django: it talks to the portal over HTTP only.
"""
