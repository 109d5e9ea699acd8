"""The label set reviewers start from, and the reviewers group recordings are shared with."""

from django.db import migrations

LABELS = [
    ("talked over the caller", "The agent spoke while the caller was still talking."),
    ("missed a turn", "The caller finished and the agent never answered."),
    ("too slow", "The agent answered, but too late."),
    ("wrong answer", "What the agent said was wrong or off-topic."),
    ("echo", "The agent heard itself (its audio came back through the caller's microphone)."),
    ("good", "This stretch went well."),
]
REVIEWERS = "reviewers"


def seed(apps, schema_editor):
    Label = apps.get_model("recordings", "Label")
    for position, (name, description) in enumerate(LABELS):
        Label.objects.get_or_create(name=name, defaults={"description": description, "position": position})
    apps.get_model("auth", "Group").objects.get_or_create(name=REVIEWERS)


def unseed(apps, schema_editor):
    Label = apps.get_model("recordings", "Label")
    Label.objects.filter(name__in=[name for name, _ in LABELS], annotations__isnull=True).delete()


class Migration(migrations.Migration):
    dependencies = [("recordings", "0005_review"), ("auth", "0012_alter_user_first_name_max_length")]
    operations = [migrations.RunPython(seed, unseed)]
