-- +goose Up
-- events show lists the changes an event made: without this index that
-- is a scan of the whole feed.
CREATE INDEX changes_event ON changes (event_id);

-- +goose Down
DROP INDEX changes_event;
