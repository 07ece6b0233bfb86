"""Database backends for the app's projects (a subclass of Django's, opted into by ENGINE)."""
