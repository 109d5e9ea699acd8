from django.apps import AppConfig


class AccountsConfig(AppConfig):
    name = "webapp.accounts"
    label = "accounts"

    def ready(self) -> None:
        from webapp.accounts.revocation import connect_signals

        connect_signals()  # revoked keys and deactivated users end their live calls
