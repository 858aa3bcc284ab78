"""Conversation continuity: which conversation a request continues, and on which backend,
across turns, workers and proxies.

`resolver` names a request's conversation (declared, else by continuity with an answer the
fleet gave, else by the masked opening) and keeps its links; `chains` maps a Responses
answer's id to its conversation, turn and backend, and the candidate's ids of the shadow
copies. Both keep what they learn in the rollout store (kvmigrate.rollout.store), keyed by
its hash (kvmigrate.rollout.keys), and, for the workers of `proxy --workers N`, in tables in
memory they all map (`link_table`, `shadow_id_table`, over `slot_table`). The decisions are pure
functions in kvmigrate.policies (continuity, conversation, chain).
"""
