"""Conversations: capture chat transcripts as records of kind ``conversation`` (issue 17).

:mod:`.formats` reads JSON Lines chat logs (Claude Code transcripts included), Markdown
``Speaker: text`` transcripts and LoCoMo JSON; :mod:`.capture` stores each session as one record
(deduplicated, revised when it grew); :mod:`.fragments` cuts such a record at turn boundaries for
the index and says which turns a byte range holds.
"""
