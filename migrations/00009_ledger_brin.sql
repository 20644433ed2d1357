-- +goose Up
-- Every first delivery writes a webhook_events row and, when a row the
-- app reads changed, a changes row. Their time columns had btree indexes:
-- two more insertions at the right edge of an index per delivery, pages
-- every backend writes to. A BRIN index costs an insert next to nothing
-- (the newest page ranges are not even summarized until a vacuum), and
-- these columns grow with the tables' physical order. They still serve
-- `events list --since` and `events show`. The retention trim walks the
-- primary key instead: as vacuum hands trimmed pages to new rows, those
-- ranges' summaries widen, and a trim in time order would come to read
-- most of the table (docs/PERFORMANCE.md).
DROP INDEX webhook_events_first_seen;
CREATE INDEX webhook_events_first_seen ON webhook_events USING brin (first_seen_at);
DROP INDEX changes_at;
CREATE INDEX changes_at ON changes USING brin (at);

-- +goose Down
DROP INDEX changes_at;
CREATE INDEX changes_at ON changes (at);
DROP INDEX webhook_events_first_seen;
CREATE INDEX webhook_events_first_seen ON webhook_events (first_seen_at);
