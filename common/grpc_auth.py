"""LocalAI's entry point for the interceptors every Python backend installs.

LocalAI's backends build their server with `interceptors=get_auth_interceptors(aio=...)`,
importing this module with common/ itself on sys.path; our own server uses
auth.server_interceptors() and checks model identity in the servicer.
"""

try:  # imported as common.grpc_auth
    from . import auth, model_identity, parent_watch
except ImportError:  # imported flat, as LocalAI's backends do
    import auth
    import model_identity
    import parent_watch

# LocalAI's names for the bearer-token interceptors.
TokenAuthInterceptor = auth.SyncBearerTokenInterceptor
AsyncTokenAuthInterceptor = auth.BearerTokenInterceptor


def get_auth_interceptors(*, aio: bool = False) -> list:
    """Arms the parent watch (once), then returns the bearer-token check when
    LOCALAI_GRPC_AUTH_TOKEN is set, followed by the model-identity guard, which is
    always there. The token check comes first, so a caller without the token
    learns nothing, not even which model is loaded."""
    parent_watch.start_parent_death_watcher()
    identity = model_identity.AsyncModelIdentityInterceptor() if aio else model_identity.ModelIdentityInterceptor()
    return auth.server_interceptors(aio=aio) + [identity]
