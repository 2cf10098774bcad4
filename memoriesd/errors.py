"""The one error tree of Memories.

Every failure a user can see is a :class:`MemoriesError` with a stable ``code``
(documented in docs/commands.md, "Error codes") and a message that is the user's explanation: what went
wrong and what to do. Dependency errors are translated at the boundary
(``raise SomeError(...) from exc``). Messages never contain note text, titles,
passphrases or keys.

The CLI maps codes to exit codes with :func:`exit_code_for`.
"""

from __future__ import annotations

# Exit codes of the CLI (stable, documented in docs/commands.md).
EXIT_OTHER = 1
EXIT_USAGE = 2
EXIT_LOCKED = 3
EXIT_NOT_FOUND = 4
EXIT_CORRUPT = 5
EXIT_UNREACHABLE = 6

_EXIT_BY_CODE: dict[str, int] = {
    "usage": EXIT_USAGE,
    "invalid_params": EXIT_USAGE,
    "query_invalid": EXIT_USAGE,
    "passphrase_required": EXIT_USAGE,
    "keyring_unreadable": EXIT_USAGE,
    "confirmation_required": EXIT_USAGE,
    "vault_locked": EXIT_LOCKED,
    "bad_passphrase": EXIT_LOCKED,
    "not_found": EXIT_NOT_FOUND,
    "vault_not_found": EXIT_NOT_FOUND,
    "vault_corrupt": EXIT_CORRUPT,
    "daemon_unreachable": EXIT_UNREACHABLE,
    "busy": EXIT_UNREACHABLE,
    "sync_target": EXIT_UNREACHABLE,
}


def exit_code_for(code: str) -> int:
    """Exit code the CLI uses for an error code."""
    return _EXIT_BY_CODE.get(code, EXIT_OTHER)


class MemoriesError(Exception):
    """Base of every user-facing error. ``code`` is stable; ``message`` is one line."""

    code: str = "internal"

    def __init__(self, message: str, *, code: str | None = None) -> None:
        # Keep it to one line whatever the caller passed.
        message = " ".join(str(message).split())
        super().__init__(message)
        self.message = message
        if code is not None:
            self.code = code

    def to_dict(self) -> dict[str, str]:
        return {"code": self.code, "message": self.message}


class UsageError(MemoriesError):
    code = "usage"


class ConfirmationRequired(UsageError):
    """A destructive command would ask, but there is no terminal to ask on: ``--yes`` says it."""

    code = "confirmation_required"


class InvalidParams(MemoriesError):
    """A request's parameters have the wrong shape (protocol level)."""

    code = "invalid_params"


class ConfigError(MemoriesError):
    code = "config_invalid"


class HomeError(MemoriesError):
    code = "home_invalid"


class DaemonUnreachable(MemoriesError):
    code = "daemon_unreachable"


class Busy(MemoriesError):
    """The daemon already serves ``[daemon] max_connections`` connections: this one is refused."""

    code = "busy"


class DaemonRunning(MemoriesError):
    code = "daemon_running"


class ProtocolError(MemoriesError):
    code = "protocol_error"


class FrameTooLarge(ProtocolError):
    code = "frame_too_large"


class UnknownMethod(MemoriesError):
    code = "unknown_method"


class VaultLocked(MemoriesError):
    code = "vault_locked"


class BadPassphrase(MemoriesError):
    code = "bad_passphrase"


class VaultCorrupt(MemoriesError):
    code = "vault_corrupt"


class DiskError(MemoriesError):
    """The disk reported an error while a vault was written (a failed write, fsync or rename).

    When it says the durability is unknown, the store refuses every further write until the
    vault is locked and unlocked (which re-reads the files and recovers what was written).
    """

    code = "io_error"


class VaultNotFound(MemoriesError):
    code = "vault_not_found"


class VaultExists(MemoriesError):
    code = "vault_exists"


class VaultAmbiguous(MemoriesError):
    code = "vault_ambiguous"


class NotFound(MemoriesError):
    """A record (or revision) that does not exist — or that the caller may not see."""

    code = "not_found"


class KeyringUnavailable(MemoriesError):
    code = "keyring_unavailable"


class DocumentRefused(MemoriesError):
    """A file that is not UTF-8 text/Markdown, or too large."""

    code = "document_refused"


class QueryInvalid(MemoriesError):
    code = "query_invalid"


class CapExceeded(MemoriesError):
    """A cache cap (fragments, source bytes, vector bytes) would be exceeded."""

    code = "cap_exceeded"


class ModelUnavailable(MemoriesError):
    code = "model_unavailable"


class ModelInstallError(MemoriesError):
    code = "model_install_failed"


class DigestMismatch(ModelInstallError):
    code = "digest_mismatch"


class UrlRefused(MemoriesError):
    code = "url_refused"


class HttpError(MemoriesError):
    """A remote service failed (after the retries the config allows)."""

    code = "http_error"


class HttpTimeout(HttpError):
    code = "timeout"


class AuthFailed(HttpError):
    code = "auth_failed"


class RedirectRefused(HttpError):
    code = "redirect_refused"


class InvalidModelOutput(MemoriesError):
    code = "invalid_model_output"



class ModelInputFailed(InvalidModelOutput):
    """The local model failed on (or gave no usable vector for) particular inputs: a batch of
    fragments is retried one by one and the one that fails is skipped, not the pass."""

class RerankFailed(MemoriesError):
    code = "rerank_failed"


class GenerationNotConfigured(MemoriesError):
    code = "generation_not_configured"


class DeviceOnly(MemoriesError):
    code = "device_only"


class Cancelled(MemoriesError):
    code = "cancelled"


class ScopeDenied(MemoriesError):
    code = "scope_denied"


class GrantInvalid(MemoriesError):
    code = "grant_invalid"


class SyncTargetError(MemoriesError):
    """A sync target (a folder, an rclone remote) cannot be read or written now: the drive is not
    mounted, the server is down, rclone is missing. Nothing was lost; sync retries later."""

    code = "sync_target"


class Internal(MemoriesError):
    code = "internal"
