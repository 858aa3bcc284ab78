"""The gated rollout: its state, the stores that keep it (and the keyed hash they keep
conversation keys under), the controller, the gates' wiring, the watcher and the commands'
client. Conversation continuity, which writes its links to the same store, is
kvmigrate.continuity."""
