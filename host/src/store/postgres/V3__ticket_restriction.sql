-- Version 3: a ticket keeps the run restrictions its call asked under.
ALTER TABLE awaiting ADD COLUMN restriction TEXT;
