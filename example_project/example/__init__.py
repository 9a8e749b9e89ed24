"""A small Django site that shows django-redislock at work."""
