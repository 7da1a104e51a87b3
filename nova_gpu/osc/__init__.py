"""``openstack gpu ...``: the python-openstackclient plugin of nova-gpu."""
