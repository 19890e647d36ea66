-- Responses kept by the gateway's /v1/responses (store: true, the default): the response
-- object and its conversation (input and output items), for previous_response_id, GET and
-- DELETE, scoped to the gateway key's namespace and team; removed after
-- --retention-responses (docs/gateway.md#responses).
CREATE TABLE gateway_responses (
    id              TEXT PRIMARY KEY,
    namespace       TEXT NOT NULL,
    team            TEXT NOT NULL,
    created_at      BIGINT NOT NULL,
    conversation    TEXT NOT NULL,
    response        TEXT NOT NULL
);
CREATE INDEX gateway_responses_created ON gateway_responses (created_at);
