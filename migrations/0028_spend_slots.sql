-- A project's day of spend was one row that every session report of the project updated, so
-- reports queued on its lock (about 300 a second at most). It is now a few rows, slots, summed
-- when read: a writer takes a slot no other transaction holds (FOR UPDATE SKIP LOCKED) or
-- adds one, so no report waits on another's. The slots of a day are about as many as reports
-- ever wrote at the same moment. A slot may go below zero (a correction); a day's sum is not
-- read below zero.
ALTER TABLE spend ADD COLUMN slot integer NOT NULL DEFAULT 0;
ALTER TABLE spend DROP CONSTRAINT spend_pkey;
ALTER TABLE spend ADD PRIMARY KEY (org_id, project_id, day, slot);
