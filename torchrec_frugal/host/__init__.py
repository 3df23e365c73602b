"""Host memory shared by the ranks of a machine: shared-memory segments, the tables' rows,
mailboxes, the control record, registration with the device, the rank launcher, and the ranks'
agreement on each batch through named pipes."""
