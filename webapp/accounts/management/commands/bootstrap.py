"""``python manage.py bootstrap``: the first-run admin account for ``make run`` (idempotent).

Migrations are run separately. When no superuser exists, one is created with a generated
password saved to ``var/admin-password.txt`` (mode 0600); later runs only say where it is.
"""

import secrets

from django.conf import settings
from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand


class Command(BaseCommand):
    help = "Create the admin account if none exists and print how to log in."

    def add_arguments(self, parser):
        parser.add_argument("--url", default="http://127.0.0.1:8000/", help="The address the server will listen on.")
        parser.add_argument("--username", default="admin")

    def handle(self, *args, **options):
        url = options["url"].rstrip("/") + "/"
        password_file = settings.PARLEY_ADMIN_PASSWORD_FILE
        user_model = get_user_model()
        if user_model.objects.filter(is_superuser=True).exists():
            self.stdout.write(f"Parley: log in at {url}accounts/login/ with the admin account.")
            if password_file.exists():
                self.stdout.write(f"The generated admin password is in {password_file}.")
            return
        password = secrets.token_urlsafe(12)
        user_model.objects.create_superuser(username=options["username"], email="", password=password)
        password_file.parent.mkdir(parents=True, exist_ok=True)
        password_file.touch(mode=0o600)
        password_file.write_text(f"{options['username']}\n{password}\n")
        self.stdout.write(
            f"Created the admin account.\n  URL:      {url}accounts/login/\n"
            f"  username: {options['username']}\n  password: {password}\n"
            f"(saved in {password_file}; API keys at {url}accounts/keys/, invites at {url}accounts/invites/)"
        )
