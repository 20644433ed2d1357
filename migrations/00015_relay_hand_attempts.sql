-- +goose Up
-- Attempts that relay retry ran by hand, left for the replica that leads
-- the relay to count in relay_deliveries_total (a command's counters are
-- scraped by no one) and delete. A new table: the previous release
-- neither reads nor writes it, and a rollback to it leaves it as it is.
CREATE TABLE relay_hand_attempts (
    id       bigint      GENERATED ALWAYS AS IDENTITY PRIMARY KEY,
    consumer text        NOT NULL,
    outcome  text        NOT NULL,
    at       timestamptz NOT NULL DEFAULT now()
);

-- +goose Down
DROP TABLE relay_hand_attempts;
