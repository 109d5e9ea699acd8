"""One user's persistent ``DialogueSession`` and what it alone owns: its narrow view of the service
(``context``), its connections' handles and outboxes, its timers, stream positions, metrics and the
session's side of its recording."""
