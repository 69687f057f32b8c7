"""One text from a job's attempts, for a stream that cannot take back what it sent.

A job whose worker was lost usually continues from its log; one that cannot (docs/reliability.md)
starts over, and its log holds the abandoned attempt's chunks, a `restart`, then the new
attempt's. An OpenAI stream has no way to say "drop what you have" (chat chunks cannot be taken
back; Responses events are numbered and clients resume by number): it goes on unseen when nothing
of the answer was shown yet, or when the new attempt first says again what was shown (a greedy or
seeded answer does), showing only what it adds. Only a new attempt that says something else
cannot be joined (`diverged`); the stream then ends with a `worker_lost` error.
"""
from __future__ import annotations


class AttemptJoin:
    def __init__(self) -> None:
        self.seen = ""  # the text fed so far, across attempts as one
        self._again: str | None = None  # after a restart: the new attempt's text while it says `seen` again
        self.diverged = False

    def feed(self, text: str) -> str:
        """What of `text` is new to the stream ('' while a new attempt says the old text again)."""
        if self._again is not None:
            self._again += text
            if self.seen.startswith(self._again):
                return ""
            if not self._again.startswith(self.seen):
                self.diverged = True
                return ""
            text, self._again = self._again[len(self.seen):], None
        self.seen += text
        return text

    def take(self, text: str, logprobs: list | None = None) -> tuple[str, list | None] | None:
        """A chunk's text and logprobs as new to the stream, or None while a new attempt says again
        what was shown. Of a chunk that ends such a repeat, which tokens are new is not known: its
        logprobs are dropped (the old ones stand)."""
        again = self.saying_again
        text = self.feed(text)
        if again and not text:
            return None
        return text, None if again else logprobs

    def restart(self, shown: bool) -> None:
        """The job started over. `shown`: some of its answer reached the client; if not, the new
        attempt simply replaces the old one (the caller starts its reading of the text over)."""
        if shown:
            self._again = ""
        else:
            self.seen = ""

    def end(self) -> None:
        """The job ended: one that stopped short of what was shown cannot be joined either."""
        if self._again is not None and self._again != self.seen:
            self.diverged = True

    @property
    def saying_again(self) -> bool:
        """A new attempt is still saying again what was shown."""
        return self._again is not None
