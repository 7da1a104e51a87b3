import sys

from nova_gpu.agent import cli

sys.exit(cli.main())
