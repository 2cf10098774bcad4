"""Record kinds as plug-ins: how each kind of record is fragmented, titled, embedded and filtered."""
