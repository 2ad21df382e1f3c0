-- A claim finds the oldest due pending job through jobs_active (state, due_at, id), whose first leaves also hold the
-- claimed entries ('claimed' sorts before 'pending'), so a claim and a completion rewrite one page of it; jobs_due
-- held the pending entries a second time, a third page written by every claim.
DROP INDEX jobs_due;
