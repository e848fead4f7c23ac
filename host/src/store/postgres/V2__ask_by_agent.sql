-- Version 2: an ask is found by agent too (stateless requests have no run to share).
CREATE INDEX awaiting_agent_call ON awaiting (agent, tool_id, argument_digest);
