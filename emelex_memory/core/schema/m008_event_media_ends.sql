
-- Each event records the media bytes its Session's events refer to through itself (the running total of the sizes
-- in asset_refs), so an append checks the replay view's aggregate media cap from its newest event and the event its
-- newest Summary covers up to, without summing the transcript.
ALTER TABLE events ADD COLUMN media_end INTEGER NOT NULL DEFAULT 0 CHECK (media_end >= 0);
UPDATE events SET media_end = w.total
    FROM (SELECT e.id, sum(coalesce((SELECT sum(json_extract(r.value, '$[1]')) FROM json_each(e.asset_refs) r), 0))
          OVER (PARTITION BY e.session_id ORDER BY e.seq) AS total FROM events e) AS w
    WHERE events.id = w.id AND w.total > 0;
