"""JDBC dataset names: the naming spec's namespace and name, never a credential."""

from __future__ import annotations

import pytest

from producer.spark.naming import from_jdbc


@pytest.mark.parametrize("url, namespace, name", [
    # Oracle thin, service name and SID forms, with and without user/password.
    ("jdbc:oracle:thin:scott/tiger@//db:1521/ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:scott/tiger@db:1521:ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:@//db:1521/ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:@db:1521:ORCL", "oracle://db:1521", "ORCL.hr.emp"),
    ("jdbc:oracle:thin:scott/tiger@(DESCRIPTION=(ADDRESS=(PROTOCOL=TCP)(HOST=db)(PORT=1521))"
     "(CONNECT_DATA=(SERVICE_NAME=ORCL)))", "oracle://db:1521", "ORCL.hr.emp"),
    # DB2 properties after the database.
    ("jdbc:db2://db:50000/SAMPLE:user=scott;password=tiger;", "db2://db:50000", "SAMPLE.hr.emp"),
    ("jdbc:db2://db:50000/SAMPLE", "db2://db:50000", "SAMPLE.hr.emp"),
    # Others that carry credentials in the URL.
    ("jdbc:postgresql://scott:tiger@db:5432/shop?password=tiger", "postgres://db:5432", "shop.hr.emp"),
    ("jdbc:sqlserver://db:1433;databaseName=shop;user=scott;password=tiger", "sqlserver://db:1433", "shop.hr.emp"),
    ("jdbc:teradata://db/DATABASE=shop,USER=scott,PASSWORD=tiger", "teradata://db", "shop.hr.emp"),
    ("jdbc:mysql://db:3306/shop;password=tiger", "mysql://db:3306", "shop.hr.emp"),
])
def test_jdbc_names_follow_the_spec_without_credentials(url, namespace, name):
    got = from_jdbc(url, "hr.emp")
    assert got == (namespace, name)
    assert not any(secret in part.lower() for part in got for secret in ("scott", "tiger", "user", "password"))
