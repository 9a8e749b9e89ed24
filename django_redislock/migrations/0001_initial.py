"""Creates the permission rows of the unmanaged HeldLock model (no table is created)."""

from django.db import migrations, models


class Migration(migrations.Migration):
    initial = True

    dependencies: list[tuple[str, str]] = []

    operations = [
        migrations.CreateModel(
            name="HeldLock",
            fields=[
                ("name", models.CharField(max_length=1024, primary_key=True, serialize=False)),
            ],
            options={
                "verbose_name": "lock",
                "verbose_name_plural": "locks",
                "default_permissions": ("view",),
                "permissions": [
                    ("release_lock", "Can force-release held locks"),
                    ("extend_lock", "Can extend the lease of held locks"),
                ],
                "managed": False,
            },
        ),
    ]
