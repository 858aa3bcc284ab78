"""The gated rollout (its state, store, controller and gates' wiring) and conversation
continuity (which backend a conversation is on, across turns and proxies)."""
