from envs.bench.steps import main

main()
