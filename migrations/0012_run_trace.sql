-- Each run keeps the trace context of what created it (the webhook delivery or the API request
-- whose span is the trace's root), so that its steps' spans, wherever they run, join that one
-- trace: `traceparent` (W3C) beside the `trace_id` column the schema has had since 0001.
-- Written only by the store's run insert (`store::runs::submit`), from what the caller gives;
-- both are null when tracing is not exported.
ALTER TABLE runs ADD COLUMN traceparent text;
