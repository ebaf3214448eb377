"""Drop-in faces of kvref for code written against other managers' APIs."""
