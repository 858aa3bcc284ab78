"""Feedback: scores clients give a conversation or an answer (`POST /v1/feedback`), stored
beside the records so the report can join them to the arm that served the conversation."""
