from django.db import migrations, models


class Migration(migrations.Migration):

    dependencies = [
        ('fairqueue', '0006_tenant_limits'),
    ]

    operations = [
        migrations.AddField(
            model_name='outboxjob',
            name='retry_at',
            field=models.DateTimeField(blank=True, null=True),
        ),
    ]
