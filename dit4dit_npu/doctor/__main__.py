from dit4dit_npu.doctor.cli import main

if __name__ == "__main__":
    raise SystemExit(main())
