"""``python manage.py createapikey USERNAME``: create an API key and print it (once)."""

from django.contrib.auth import get_user_model
from django.core.management.base import BaseCommand, CommandError

from webapp.accounts.services import apikey_create


class Command(BaseCommand):
    help = "Create an API key for USERNAME and print it. The key is not stored and cannot be shown again."

    def add_arguments(self, parser):
        parser.add_argument("username")
        parser.add_argument("--name", default="created by manage.py createapikey")

    def handle(self, *args, **options):
        user = get_user_model().objects.filter(username=options["username"]).first()
        if user is None:
            raise CommandError(f"No user named {options['username']!r}.")
        _, raw_key = apikey_create(user=user, name=options["name"])
        self.stdout.write(raw_key)
