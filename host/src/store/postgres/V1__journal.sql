-- Version 1: the journal as SQLite's version 3 has it (runs with their
-- restriction, steps with who approved, asks with a holder and a heartbeat
-- lease), in PostgreSQL types. Times are Unix seconds from the host clock.
CREATE TABLE runs (
    run_id TEXT PRIMARY KEY,
    agent TEXT NOT NULL,
    narrowing TEXT NOT NULL,
    restriction TEXT,
    started_at BIGINT NOT NULL
);
CREATE TABLE steps (
    seq BIGINT GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    run_id TEXT NOT NULL,
    call_id TEXT NOT NULL,
    tool_id TEXT NOT NULL,
    arguments TEXT NOT NULL,
    verdict TEXT NOT NULL,
    outcome TEXT NOT NULL,
    result TEXT NOT NULL,
    captured TEXT NOT NULL,
    ticket_id TEXT,
    committed_at BIGINT NOT NULL,
    structured BOOLEAN NOT NULL DEFAULT FALSE,
    approved_by TEXT,
    approved_via TEXT,
    approved_at BIGINT
);
CREATE INDEX steps_run ON steps (run_id, seq);
CREATE INDEX steps_ticket ON steps (ticket_id) WHERE ticket_id IS NOT NULL;
CREATE TABLE awaiting (
    -- Order of asking (prior asks: the latest wins).
    ordinal BIGINT GENERATED ALWAYS AS IDENTITY UNIQUE,
    ticket_id TEXT PRIMARY KEY,
    run_id TEXT NOT NULL,
    agent TEXT NOT NULL,
    call_id TEXT NOT NULL UNIQUE,
    tool_id TEXT NOT NULL,
    arguments TEXT NOT NULL,
    argument_digest TEXT NOT NULL,
    component_digest TEXT NOT NULL,
    expires_at BIGINT NOT NULL,
    requested_at BIGINT,
    state TEXT NOT NULL CHECK (state IN ('pending', 'claimed', 'resolved')),
    claimed_at BIGINT,
    holder TEXT,
    delivered BOOLEAN NOT NULL DEFAULT FALSE
);
CREATE INDEX awaiting_call ON awaiting (run_id, tool_id, argument_digest);
CREATE INDEX awaiting_claimed ON awaiting (holder) WHERE state = 'claimed';
CREATE TABLE tool_state (
    agent TEXT NOT NULL,
    tool_id TEXT NOT NULL,
    key TEXT NOT NULL,
    value TEXT NOT NULL,
    PRIMARY KEY (agent, tool_id, key)
);
CREATE TABLE hosts (
    instance_id TEXT PRIMARY KEY,
    heartbeat_at BIGINT NOT NULL
);
