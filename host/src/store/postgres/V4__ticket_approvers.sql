-- Version 4: a ticket keeps who may decide it, as when its call asked
-- (NULL for asks made before: they can be denied, not approved).
ALTER TABLE awaiting ADD COLUMN approvers TEXT;
